#!/bin/sh
[ "$(cat /logs/agent/who)" = 1000 ] && [ "$(id -u)" = 0 ] && echo 1 > /logs/verifier/reward.txt
