"""One file per algorithm, each readable top to bottom: config, build, loop."""
