NOGRAPH=1 TG32=1 bash bench/gpu-placement-run.sh /tmp/w 10 4 3
