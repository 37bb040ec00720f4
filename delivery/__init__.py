"""Delivery: a trainer's records to the broker, without ever blocking training or losing a step.

The Kafka sink (:mod:`.kafka_sink`) and what stands behind its ``write``: the numbering of each
run's stream (:mod:`.stream_numbers`), the encoding (:mod:`.sink_encoding`), the sending thread
(:mod:`.sender`) with its spool on disk (:mod:`.spool`, :mod:`.sink_spool`, :mod:`.stranded`),
what could not be sent (:mod:`.rejects`), the confirmation at close (:mod:`.confirm`), the
control topic's requests (:mod:`.control_requests`) and ``foreshock spool flush``
(:mod:`.commands`).

Why a room of its own: it is torch-free (a service or a laptop flushes a spool without torch)
and knows nothing of models; the monitors (``foreshock.producers``) hand it plain records.
"""
