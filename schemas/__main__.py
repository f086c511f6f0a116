"""`python -m schemas`: rewrite schemas/standalone/ (the self-contained schema of each topic)
from the `.avsc` files, after changing one of them."""

from schemas.contract import SCHEMA_DIR, write_standalone

for path in write_standalone():
    print(path.relative_to(SCHEMA_DIR.parent))
