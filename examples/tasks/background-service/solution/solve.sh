#!/bin/bash
set -euo pipefail
nohup perl /opt/kv/server.pl 7070 >/tmp/kv.log 2>&1 &
# Wait until it listens.
for _ in $(seq 100); do
    if (exec 3<>/dev/tcp/127.0.0.1/7070) 2>/dev/null; then
        break
    fi
    sleep 0.05
done
exec 3<>/dev/tcp/127.0.0.1/7070
echo "SET greeting sifbox" >&3
read -r -t 5 reply <&3
echo QUIT >&3
echo "server said: $reply"
[[ $reply == OK ]]
