"""What a run leaves behind: step snapshots, delta recordings and their byte codec, trace files
(a recorded run on disk), the memory-waste breakdown, and the slot and block state codes."""
