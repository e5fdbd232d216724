"""The cloud's preemption notice, from its first sighting to the next boot's verdict: the
watcher thread that polls the metadata service (`watcher`), the notice and the one place that
answers whether one stands (`notice`: the tick's `Hold`, the run dir's checkpoint request the
uploader reads, the previous boot's notice the start-up reads), and the participant that owns a
notice's life in the tick (`participant`)."""
