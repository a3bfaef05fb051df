#!/bin/bash
# Reward 1 when the agent saw only the loopback interface, the verifier
# sees only lo too, and no connection leaves the sandbox.
ok=1
if [[ $(cat /app/interfaces.txt 2>/dev/null) != lo ]]; then
    echo "FAIL: /app/interfaces.txt is not just lo: $(cat /app/interfaces.txt 2>&1)"
    ok=0
fi
seen=$(awk -F: 'NR > 2 { gsub(/ /, "", $1); print $1 }' /proc/net/dev)
if [[ $seen != lo ]]; then
    echo "FAIL: the verifier sees interfaces: $seen"
    ok=0
fi
if timeout 3 bash -c 'exec 3<>/dev/tcp/1.1.1.1/80' 2>/dev/null; then
    echo "FAIL: a TCP connection to 1.1.1.1:80 succeeded"
    ok=0
fi
if [[ $(cat /sys/class/net/lo/operstate 2>/dev/null) == down ]]; then
    echo "FAIL: lo is down"
    ok=0
fi
echo "reward: $ok"
echo "$ok" > /logs/verifier/reward.txt
