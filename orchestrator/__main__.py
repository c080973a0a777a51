"""python3 job.pyz RUN_DIR/job.json (or python3 -m orchestrator RUN_DIR/job.json): run the job."""

import sys

from orchestrator.job import main

if __name__ == "__main__":
    sys.exit(main())
