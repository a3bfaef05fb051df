#!/bin/sh
[ "$(cat /etc/built-here)" = yes ] && [ "$(cat /logs/agent/done)" = built ] && echo 1 > /logs/verifier/reward.txt
