#!/bin/sh
echo '{"accuracy": 0.5, "passed": 3}' > /logs/verifier/reward.json
