#!/bin/sh
id -u > /logs/agent/who
