#!/usr/bin/env bash
# Wheels larger than what one device call carries (64 MiB with the tree; onnxruntime-gpu 1.31.1 for cp312 is
# 255.6 MB) travel in parts, one part per call, into /tmp/big of a warm machine; h200.sh joins and installs them
# once every part is there (a machine that went idle lost them: the join says so and installs nothing).
#   bash experiments/bigwheel.sh split WHEEL   here: .bigwhl/NAME.part-NN (36 MiB each) and .bigwhl/NAME.sha256
#   bash experiments/bigwheel.sh stash         there, one call per part, carry [".bigwhl/NAME.part-NN"]
#   bash experiments/bigwheel.sh join          there (h200.sh does it; carry the .sha256): the joined wheels' paths
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  split)
    w=$2; n=$(basename "$w"); mkdir -p .bigwhl
    split -b 36M -d "$w" ".bigwhl/$n.part-"
    (cd "$(dirname "$w")" && sha256sum "$n") > ".bigwhl/$n.sha256"
    ls -la .bigwhl ;;
  stash)
    mkdir -p /tmp/big && cp .bigwhl/*.part-* /tmp/big/ && ls -la /tmp/big ;;
  join)
    root=$PWD
    for m in .bigwhl/*.sha256; do
      [ -f "$m" ] || continue
      n=$(basename "$m" .sha256)
      [ -f "/tmp/big/$n" ] || cat /tmp/big/"$n".part-* > "/tmp/big/$n" 2>/dev/null || true
      if (cd /tmp/big && sha256sum -c --status "$root/$m"); then echo "/tmp/big/$n"
      else echo "bigwheel: $n is incomplete in /tmp/big (stash every part first); not installed" >&2; rm -f "/tmp/big/$n"; fi
    done ;;
  *) echo "usage: bigwheel.sh split WHEEL | stash | join" >&2; exit 2 ;;
esac
