#!/usr/bin/env python3
"""Start an mxtrain training job on Amazon SageMaker (docs/sagemaker.md).

The image is the repository's Dockerfile pushed to ECR; SageMaker runs it as `docker run IMAGE
train` on every instance, and `mxtrain train` reads the job's hyperparameters and channels. With
spot instances the job is interrupted with SIGTERM, mxtrain saves a checkpoint in
/opt/ml/checkpoints (synced to --checkpoint-s3), and the restarted job resumes from it.

    python3 launch.py --image-uri ACCOUNT.dkr.ecr.REGION.amazonaws.com/mxtrain:latest \\
        --role arn:aws:iam::ACCOUNT:role/SageMakerRole --train-s3 s3://BUCKET/corpus/ \\
        --checkpoint-s3 s3://BUCKET/checkpoints/run-1/ --spot

--dry-run prints the Estimator's arguments as JSON and needs no AWS account or `sagemaker`
package (pip install sagemaker for a real launch). METRIC_DEFINITIONS are the regexes the
SageMaker console charts from mxtrain's log lines; tests/sagemaker/sagemaker_docs_test.py checks
them against a real run's log, and that docs/sagemaker.md shows the same list.
"""
import argparse
import json
import sys

# Regexes over mxtrain's stdout (Python `re`, the first group is the value). Throughput is
# charted as TFLOP/s and step time: the tok/s field carries thousands separators (43,021).
METRIC_DEFINITIONS = [
    {"Name": "train:loss", "Regex": r"\[rank 0\] step \d+/\d+ \| loss ([0-9.]+)"},
    {"Name": "validation:loss", "Regex": r"\[rank 0\] step \d+/\d+ \| val_loss ([0-9.]+)"},
    {"Name": "train:learning_rate", "Regex": r"\| lr ([0-9.]+e[-+][0-9]+) \|"},
    {"Name": "train:grad_norm", "Regex": r"\| grad_norm ([0-9.]+) \|"},
    {"Name": "train:step_ms", "Regex": r"\| ([0-9.]+) ms \|"},
    {"Name": "train:tflops", "Regex": r"\| ([0-9.]+) TFLOP/s"},
    {"Name": "train:mfu_percent", "Regex": r"\| MFU ([0-9.]+)%"},
]

# The seed's names (docs/sagemaker.md lists them; any config key works too, dotted or dashed).
# A Llama-1B on one p5.48xlarge (8 x H100): 8 sequences of 2048 tokens per GPU, BF16, a
# checkpoint every 100 steps. The train channel holds text or .jsonl files and TinyLlama's
# tokenizer.model, which mxtrain tokenizes before training.
HYPERPARAMETERS = {
    "model": "llama-1b",
    "precision": "bf16",
    "batch-size": 8,
    "seq-length": 2048,
    "steps": 2000,
    "lr": 3e-4,
    "warmup-steps": 100,
    "recompute": "selective",
    "checkpoint.every": 100,
}


def parse_arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image-uri", required=True, help="the mxtrain image in ECR")
    parser.add_argument("--role", required=True, help="the SageMaker execution role's ARN")
    parser.add_argument("--train-s3", required=True, help="S3 prefix of the train channel (documents or shards)")
    parser.add_argument("--validation-s3", help="S3 prefix of a held-out channel (default: 1 block in 20 of train)")
    parser.add_argument("--checkpoint-s3", required=True, help="S3 prefix the checkpoints sync to (resume needs it)")
    parser.add_argument("--output-s3", help="S3 prefix for the model and output archives (default: the session's)")
    parser.add_argument("--instance-type", default="ml.p5.48xlarge")
    parser.add_argument("--instance-count", type=int, default=1)
    parser.add_argument("--spot", action="store_true", help="use managed spot training (interrupted, then resumed)")
    parser.add_argument("--max-run", type=int, default=24 * 3600, help="seconds of training at most")
    parser.add_argument("--max-wait", type=int, default=48 * 3600,
                        help="spot: seconds to wait for capacity and train in all, at least --max-run")
    parser.add_argument("--hyperparameter", action="append", default=[], metavar="NAME=VALUE",
                        help="add or replace a hyperparameter (repeatable), e.g. --hyperparameter num-layers=16")
    parser.add_argument("--job-name", help="a name for the training job (default: the SDK's)")
    parser.add_argument("--dry-run", action="store_true", help="print the Estimator's arguments and stop")
    arguments = parser.parse_args(argv)
    if arguments.spot and arguments.max_wait < arguments.max_run:
        parser.error("--max-wait must be at least --max-run with --spot")
    return arguments


def estimator_arguments(arguments):
    hyperparameters = dict(HYPERPARAMETERS)
    for item in arguments.hyperparameter:
        name, separator, value = item.partition("=")
        if not separator or not name:
            raise SystemExit(f"--hyperparameter {item!r}: write NAME=VALUE")
        hyperparameters[name] = value
    options = {
        "image_uri": arguments.image_uri,
        "role": arguments.role,
        "instance_type": arguments.instance_type,
        "instance_count": arguments.instance_count,
        "hyperparameters": hyperparameters,
        "metric_definitions": METRIC_DEFINITIONS,
        "checkpoint_s3_uri": arguments.checkpoint_s3,
        "checkpoint_local_path": "/opt/ml/checkpoints",
        "use_spot_instances": arguments.spot,
        "max_run": arguments.max_run,
    }
    if arguments.spot:
        options["max_wait"] = arguments.max_wait
    if arguments.output_s3:
        options["output_path"] = arguments.output_s3
    return options


def main(argv):
    arguments = parse_arguments(argv)
    options = estimator_arguments(arguments)
    channels = {"train": arguments.train_s3}
    if arguments.validation_s3:
        channels["validation"] = arguments.validation_s3
    if arguments.dry_run:
        print(json.dumps({"estimator": options, "channels": channels}, indent=2))
        return 0
    from sagemaker.estimator import Estimator  # pip install sagemaker

    estimator = Estimator(**options)
    estimator.fit(channels, job_name=arguments.job_name, wait=False)
    print(f"started {estimator.latest_training_job.name}; the model lands in {estimator.model_data}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
