"""Warning delivery: the warnings topic to webhooks, Slack and Alertmanager (torch-free).

:mod:`.notifier` is the ``foreshock notify`` service; :mod:`.courier` one receiver's queue and
retries; :mod:`.delivery` the payloads and one HTTP try; :mod:`.targets` the receivers and their
settings; :mod:`.signing` webhook signatures. The event they deliver is
:mod:`foreshock.transport.warning`'s.
"""
