#!/bin/sh
if [ "$(cat /logs/agent/done)" = solved ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
