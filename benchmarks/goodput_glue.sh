#!/usr/bin/env bash
# The glue of the seeds (shared/seeds/ 002: "auto_restart_training.sh ... triggers on server
# boot", "watchdog_training.sh ... checks every 5 minutes, auto-restarts if processes crash";
# 003: "Replay buffer: not saved, buffer starts empty on resume"), as benchmarks/goodput.py runs
# it for contenders (c) and (d). Started once per boot, in its own session; a reboot kills it all.
#
#   goodput_glue.sh seeds DIR -- python benchmarks/goodput_script.py --dir DIR ...
#       a `while` loop restarting the script RESTART_SLEEP_S after it exits, and a watchdog that
#       every WATCHDOG_EVERY_S looks at the log and, quiet for more than QUIET_S, kills the
#       script (the loop starts it again);
#   goodput_glue.sh restart-always DIR -- ...
#       systemd's Restart=always emulated: started again RestartSec (100 ms, systemd's default)
#       after any exit; no watchdog (the script speaks no sd_notify, so no WatchdogSec).
#
# Everything the script prints goes to DIR/train.log (nohup ... >> log), its pid to DIR/train.pid.
set -u
mode=$1
dir=$2
shift 3  # mode, dir, --
log=$dir/train.log
mkdir -p "$dir"

case $mode in
  seeds) restart_sleep=${RESTART_SLEEP_S:-5} ;;
  restart-always) restart_sleep=0.1 ;;
  *) echo "goodput_glue.sh: mode '$mode': expected seeds or restart-always" >&2; exit 2 ;;
esac

if [ "$mode" = seeds ]; then
  (
    while true; do
      sleep "${WATCHDOG_EVERY_S:-300}"
      now=$(date +%s)
      seen=$(stat -c %Y "$log" 2>/dev/null || echo "$now")
      if [ $((now - seen)) -gt "${QUIET_S:-300}" ] && [ -f "$dir/train.pid" ]; then
        echo "watchdog: log quiet $((now - seen)) s, restarting $(cat "$dir/train.pid")" >> "$log"
        kill -KILL "$(cat "$dir/train.pid")" 2>/dev/null
      fi
    done
  ) &
fi

while true; do
  "$@" >> "$log" 2>&1 &
  echo $! > "$dir/train.pid"
  wait $!
  echo "glue: training exited ($?), restarting in ${restart_sleep} s" >> "$log"
  sleep "$restart_sleep"
done
