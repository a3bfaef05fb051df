#!/bin/bash
# Reward 1 when notes.txt and config.ini are as asked, else 0.
cd /app || exit 1
ok=1
if [[ $(cat notes.txt 2>/dev/null) != $'alpha\nbeta' ]]; then
    echo "FAIL: notes.txt is not 'alpha' and 'beta'"
    ok=0
fi
expected=$'[server]\nhost = 127.0.0.1\nport = 9090\nworkers = 4'
if [[ $(cat config.ini) != "$expected" ]]; then
    echo "FAIL: config.ini:"
    cat config.ini
    ok=0
fi
echo "reward: $ok"
echo "$ok" > /logs/verifier/reward.txt
