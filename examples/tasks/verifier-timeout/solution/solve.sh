#!/bin/bash
touch /tmp/done
