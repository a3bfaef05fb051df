#!/bin/bash
# Reward 1 when sorted.txt is numbers.txt in numeric order.
if [[ $(cat /data/sorted.txt 2>/dev/null) == $'1\n9\n10\n25\n100' ]]; then
    ok=1
else
    echo "FAIL: /data/sorted.txt is:"
    cat /data/sorted.txt
    ok=0
fi
echo "reward: $ok"
echo "$ok" > /logs/verifier/reward.txt
