"""The file a cluster runs as a procbus job's driver (a standalone master's PythonRunner runs a
file, not a module): it runs procbus.spark.driver. Alone in its folder, so the folder the runner
puts first on sys.path shadows nothing."""

import runpy

runpy.run_module("procbus.spark.driver", run_name="__main__")
