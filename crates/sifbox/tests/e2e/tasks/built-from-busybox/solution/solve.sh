#!/bin/sh
echo built > /logs/agent/done
