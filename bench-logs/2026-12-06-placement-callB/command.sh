bash bench/gpu-placement-run.sh /tmp/w 10 4 2
