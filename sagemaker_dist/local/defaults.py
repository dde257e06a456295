"""What a local job's request says where no AWS account stands behind it."""

LOCAL_ROLE = "arn:aws:iam::000000000000:role/sagemaker-dist-local"  # never assumed: no AWS here
LOCAL_INSTANCE_TYPE = "ml.c5.xlarge"  # a CPU type, so processes per host are given, not GPU-derived
