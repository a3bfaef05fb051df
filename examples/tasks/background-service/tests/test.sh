#!/bin/bash
# Reward 1 when a service on 127.0.0.1:7070 (still running after the agent
# ended) answers GET greeting with sifbox.
ok=0
if exec 3<>/dev/tcp/127.0.0.1/7070; then
    echo "GET greeting" >&3
    if read -r -t 5 value <&3; then
        echo "GET greeting: $value"
        [[ $value == sifbox ]] && ok=1
    else
        echo "FAIL: no answer"
    fi
    echo QUIT >&3
else
    echo "FAIL: nothing listens on 127.0.0.1:7070"
fi
echo "reward: $ok"
echo "$ok" > /logs/verifier/reward.txt
