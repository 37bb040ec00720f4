#!/usr/bin/env bash
# kcat with the librdkafka that confluent-kafka ships (2.x, current). Debian bookworm's kcat
# links librdkafka 2.0.2, which cannot parse Tansu's ApiVersion v3 reply ("Read underflow");
# against Apache Kafka plain `kcat` works. Usage: scripts/kcat.sh -C -b 127.0.0.1:9092 -t foreshock.metrics
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${FORESHOCK_PYTHON:-$root/.venv/bin/python}"
libs="$("$python" -c 'import confluent_kafka, pathlib; p = pathlib.Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"; print(next(p.glob("librdkafka*.so*")))')"
shim="${TMPDIR:-/tmp}/foreshock-rdkafka-$(id -u)"
mkdir -p "$shim"
ln -sf "$libs" "$shim/librdkafka.so.1"
LD_LIBRARY_PATH="$shim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec kcat "$@"
