#!/usr/bin/env bash
# compose/acls.sh: the secured cluster's principals (SCRAM-SHA-512 users) and what each may do
# (ACLs), with Kafka's own kafka-configs.sh and kafka-acls.sh. docker-compose.secure.yml runs it
# once as the `acls` service (after the brokers are healthy, before `topics`), and the brokers'
# healthcheck runs its `ping`. It works on any Kafka cluster of yours too (the variables below).
#
#   acls.sh [apply]     create or update the users (passwords from the environment) and add the
#                       ACLs; then list them. Safe to re-run: an ACL that exists stays as it is,
#                       a password is set again (rotation: change it, re-run, restart its users)
#   acls.sh list        list the ACLs
#   acls.sh ping [H:P]  a broker answers User:broker (default localhost:9092): the healthcheck
#
# Environment:
#   FORESHOCK_BROKER_PASSWORD       User:broker, the brokers' own principal (PLAIN, static JAAS
#                                   entry; the only super user): this script logs in as it
#   FORESHOCK_<ROLE>_PASSWORD       for ADMIN TRAINER DETECTOR SINK NOTIFY APPROVER: letters,
#                                   digits and . _ ~ -, at least 16 (each is spliced into
#                                   kafka-configs' [password=...] and a JAAS string)
#   FORESHOCK_ACLS_BOOTSTRAP        brokers (default kafka-1:9092,kafka-2:9092,kafka-3:9092)
#   FORESHOCK_ACLS_COMMAND_CONFIG   a client properties file to log in with instead of
#                                   User:broker's (any principal allowed to alter the cluster)
#   FORESHOCK_ACLS_BIN              where Kafka's tools are (default /opt/kafka/bin)
#   FORESHOCK_KAFKA_<NAME>_TOPIC    the topic names, as the services read them (default foreshock.*)
#
# Who may do what is docs/transport.md's table ("Securing the broker"); the lines under apply()
# are that table. Two rules shape it: every client lists the four topics and creates any it
# does not see (transport/topics.py), so each may Describe all four (or it would try to create
# one and be refused); and only User:approver may write the control topic, which every trainer
# obeys.

set -euo pipefail

ROLES=(admin trainer detector sink notify approver)
BIN=${FORESHOCK_ACLS_BIN:-/opt/kafka/bin}
BOOTSTRAP=${FORESHOCK_ACLS_BOOTSTRAP:-kafka-1:9092,kafka-2:9092,kafka-3:9092}
METRICS=${FORESHOCK_KAFKA_METRICS_TOPIC:-foreshock.metrics}
WARNINGS=${FORESHOCK_KAFKA_WARNINGS_TOPIC:-foreshock.warnings}
DEADLETTER=${FORESHOCK_KAFKA_DEADLETTER_TOPIC:-foreshock.deadletter}
CONTROL=${FORESHOCK_KAFKA_CONTROL_TOPIC:-foreshock.control}
# Consumer groups: the services' --group defaults (run one with another --group: grant that).
DETECTOR_GROUP=foreshock-detectors
SINK_GROUP=foreshock-sink
NOTIFY_GROUP=foreshock-notify
# Group ids that only ever assign partitions (no join, no commit), one random id per client:
# librdkafka still looks up a coordinator for any group.id, which takes Describe on the group.
CONTROL_GROUPS=foreshock-control- # a trainer's control-topic reader (delivery/control_requests.py)
ACT_GROUPS=foreshock-act-         # `warnings act --wait`'s answer reader (detectors/remedy_requests.py)
CONFIG=

fail() {
    echo "acls.sh: $*" >&2
    exit 2
}

password_of() { # the variable that holds ROLE's password
    printf 'FORESHOCK_%s_PASSWORD' "$(printf '%s' "$1" | tr '[:lower:]' '[:upper:]')"
}

check_password() { # ROLE: its password is set, and safe to splice
    local name
    name=$(password_of "$1")
    [[ -n ${!name:-} ]] || fail "$name is not set"
    [[ ${!name} =~ ^[A-Za-z0-9._~-]{16,}$ ]] ||
        fail "$name: use at least 16 letters, digits or . _ ~ - (e.g. openssl rand -hex 24)"
}

login() { # CONFIG: a client properties file that logs in as User:broker (removed at exit)
    if [[ -n ${FORESHOCK_ACLS_COMMAND_CONFIG:-} ]]; then
        CONFIG=$FORESHOCK_ACLS_COMMAND_CONFIG
        return
    fi
    check_password broker
    CONFIG=$(mktemp) # mode 600
    trap 'rm -f "$CONFIG"' EXIT
    cat >"$CONFIG" <<EOF
security.protocol=SASL_PLAINTEXT
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="broker" password="$FORESHOCK_BROKER_PASSWORD";
EOF
}

user() { # ROLE: its SCRAM-SHA-512 credential, from its password
    local name
    name=$(password_of "$1")
    "$BIN/kafka-configs.sh" --bootstrap-server "$BOOTSTRAP" --command-config "$CONFIG" \
        --alter --entity-type users --entity-name "$1" \
        --add-config "SCRAM-SHA-512=[iterations=8192,password=${!name}]"
}

allow() { # ROLE[,ROLE...] OPERATION[,OPERATION...] RESOURCE-OPTIONS...: add the ACLs
    local roles ops args=() item
    IFS=, read -ra roles <<<"$1"
    IFS=, read -ra ops <<<"$2"
    shift 2
    for item in "${roles[@]}"; do args+=(--allow-principal "User:$item"); done
    for item in "${ops[@]}"; do args+=(--operation "$item"); done
    "$BIN/kafka-acls.sh" --bootstrap-server "$BOOTSTRAP" --command-config "$CONFIG" \
        --add "${args[@]}" "$@"
}

list() {
    "$BIN/kafka-acls.sh" --bootstrap-server "$BOOTSTRAP" --command-config "$CONFIG" --list
}

apply() {
    local role all_topics
    for role in "${ROLES[@]}"; do check_password "$role"; done # all, before changing anything
    login
    for role in "${ROLES[@]}"; do user "$role"; done
    all_topics=(--topic "$METRICS" --topic "$WARNINGS" --topic "$DEADLETTER" --topic "$CONTROL")

    # everyone: see the topics (a client creates the ones it does not see)
    allow admin,trainer,detector,sink,notify,approver Describe "${all_topics[@]}"
    # admin: creates them (`foreshock topics`); the services only find them
    allow admin Create "${all_topics[@]}"
    # trainer: sends its metrics, reads the requests for its runs; at close asks whether the
    # storage sink has stored what it sent (the sink group's committed offsets: Describe)
    allow trainer Write --topic "$METRICS"
    allow trainer Read --topic "$CONTROL"
    allow trainer Describe --group "$SINK_GROUP"
    allow trainer Describe --resource-pattern-type prefixed --group "$CONTROL_GROUPS"
    # detector: reads the metrics in its group, writes warnings
    allow detector Read --topic "$METRICS"
    allow detector Read --group "$DETECTOR_GROUP"
    allow detector Write --topic "$WARNINGS"
    # sink: reads the three topics it stores, in its group
    allow sink Read --topic "$METRICS" --topic "$WARNINGS" --topic "$DEADLETTER"
    allow sink Read --group "$SINK_GROUP"
    # notify: reads the warnings in its group
    allow notify Read --topic "$WARNINGS"
    allow notify Read --group "$NOTIFY_GROUP"
    # every consumer service keeps what it cannot decode in the dead letters
    allow detector,sink,notify Write --topic "$DEADLETTER"
    # approver: the one writer of the control topic (`warnings act`); reads and writes the
    # warnings (`warnings ack|silence` publish there); reads the metrics for `act --wait`
    allow approver Write --topic "$CONTROL"
    allow approver Read,Write --topic "$WARNINGS"
    allow approver Read --topic "$METRICS"
    allow approver Describe --resource-pattern-type prefixed --group "$ACT_GROUPS"
    list
}

case "${1:-apply}" in
apply) apply ;;
list)
    login
    list
    ;;
ping)
    login
    "$BIN/kafka-broker-api-versions.sh" --bootstrap-server "${2:-localhost:9092}" \
        --command-config "$CONFIG" >/dev/null
    ;;
*) fail "usage: acls.sh [apply|list|ping [HOST:PORT]]" ;;
esac
