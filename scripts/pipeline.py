#!/usr/bin/env python3
"""The pipeline for spark-submit (the same flags as `vqueues pipeline run`):

  spark-submit --master spark://host:7077 scripts/pipeline.py \\
      --bootstrap kafka:9092 --output s3a://bucket/vq --checkpoint s3a://bucket/vq-ckpt

vqueues must be installed on the driver and the executors (`pip install vqueues[pipeline]`),
because Spark's Python workers import the source. Spark's master comes from spark-submit.
"""

import argparse
import sys

from vqueues import logs
from vqueues.cli import add_pipeline_arguments, run_pipeline

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pipeline_arguments(parser)
    logs.setup("info", "text")
    sys.exit(run_pipeline(parser.parse_args(), master_default=None))
