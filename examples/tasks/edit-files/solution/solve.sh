#!/bin/bash
set -euo pipefail
cd /app
printf 'alpha\nbeta\n' > notes.txt
sed -i 's/^port = 8080$/port = 9090/' config.ini
