#!/bin/sh
[ "$(cat /logs/agent/seen)" = "h t" ] && echo 1 > /logs/verifier/reward.txt
