#!/bin/sh
[ "$(cat /logs/agent/seen)" = "$(printf 'from-setup\n/etc\n1000')" ] && echo 1 > /logs/verifier/reward.txt
