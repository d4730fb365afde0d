"""A stand-in for offline_child that reports a result and then never exits, with a grandchild in its process
group (as vLLM's engine process would be). Used by test_bench_child.py."""

import json
import os
import subprocess
import sys
import time

spec_path, res_path, _, fd = sys.argv[1:5]
mode = json.load(open(spec_path)).get("mode", "hang_after_result")
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(res_path + ".pids", "w") as f:
    json.dump([os.getpid(), grandchild.pid], f)
progress = os.fdopen(int(fd), "w", buffering=1)
progress.write("total 1\n")
if mode == "hang_after_result":
    with open(res_path, "w") as f:
        json.dump({"row": {"impl": "kog", "ok": True, "times_one_s": [0.1], "times_full_s": [0.5]}, "host": {}}, f)
    progress.write("done\n")
time.sleep(600)
