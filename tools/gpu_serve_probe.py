import json
import sys

from replaylab.bench.provenance import provenance
from replaylab.bench.serve import matmul_row_invariance, run_ragged

out = sys.argv[1]
res = dict(provenance(["serve", "matmul rows on 1b; ragged decode, reduced grid"]))
res["matmul_rows_1b"] = (
    matmul_row_invariance("1b", batches=(1, 8), ks=(1, 4)) if "--no-matmul" not in sys.argv else []
)
bad = [r for r in res["matmul_rows_1b"] if not r["rows_equal"]]
print(
    "1b matmul rows equal:",
    len(res["matmul_rows_1b"]) - len(bad),
    "/",
    len(res["matmul_rows_1b"]),
    bad[:6],
    flush=True,
)
json.dump(res, open(out, "w"), indent=1)
res["ragged"] = run_ragged(batches=(1, 8, 64, 128), n_steps=32, spec_batches=(8, 64))
json.dump(res, open(out, "w"), indent=1)
for r in res["ragged"]["rows"]:
    print(json.dumps(r), flush=True)
