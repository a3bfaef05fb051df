#!/bin/sh
echo "$HINT $TOKEN" > /logs/agent/seen
