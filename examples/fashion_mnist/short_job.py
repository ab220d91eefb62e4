#!/usr/bin/python3
"""The demo's job.json shortened for the suite (`run.sh --short`, `run_volunteers.sh --short`):
60 steps on an 8,000-image slice, evaluated on 1,000 test images.
    short_job.py JOB_IN JOB_OUT"""
import json
import sys

job = json.load(open(sys.argv[1]))
job["training_definition"].update({"epochs": 0, "max_steps": 60})
job["data"].update({"train_samples": 8000, "test_samples": 1000})
json.dump(job, open(sys.argv[2], "w"), indent=2)
