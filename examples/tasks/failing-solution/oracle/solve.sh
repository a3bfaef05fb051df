#!/bin/bash
# Wrong on purpose: a text sort puts 100 before 25.
sort /data/numbers.txt > /data/sorted.txt
