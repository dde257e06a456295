#!/usr/bin/env bash
# Build the sagemaker-dist training image (container/Dockerfile) and push it to Amazon ECR.
#
# Usage: container/build_and_push.sh [--region REGION] [--account ID] [--repo NAME] [--tag TAG]
#                                    [--tf-version VERSION] [--pytorch [--pytorch-version V]] [--dry-run]
#   --region      AWS region (default: $AWS_REGION, $AWS_DEFAULT_REGION, then `aws configure get region`)
#   --account     12-digit account that owns the repository (default: the caller's, from STS)
#   --repo        ECR repository, created if missing (default: sagemaker-dist, sagemaker-dist-pytorch)
#   --tag         image tag (default: the package version in sagemaker_dist/__init__.py)
#   --tf-version  TensorFlow of the AWS DLC base image (default: 2.14.1)
#   --pytorch     the PyTorch image (distribution torchrun): FROM the AWS PyTorch training DLC
#   --pytorch-version  its PyTorch (default: 2.8.0, with Python 3.12 and CUDA 12.9 on Ubuntu 22.04)
#   --dry-run     print the commands instead of running them (needs --region and --account)
# Prints the pushed image URI last (commands are echoed to stderr); sagemaker_dist.launch.images.container_image_uri() builds the same URI.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
region="${AWS_REGION:-${AWS_DEFAULT_REGION:-}}"
account=""
repo=""
tag=""
tf_version="2.14.1"
pytorch=0
pytorch_version="2.8.0"
dlc_account="763104351884"
dry_run=0

usage() {
  sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

die() {
  echo "build_and_push.sh: $*" >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case "$1" in
    --region) region="${2:?--region needs a value}"; shift 2 ;;
    --account) account="${2:?--account needs a value}"; shift 2 ;;
    --repo) repo="${2:?--repo needs a value}"; shift 2 ;;
    --tag) tag="${2:?--tag needs a value}"; shift 2 ;;
    --tf-version) tf_version="${2:?--tf-version needs a value}"; shift 2 ;;
    --pytorch) pytorch=1; shift ;;
    --pytorch-version) pytorch_version="${2:?--pytorch-version needs a value}"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

run() {
  echo "+ $*" >&2
  if [ "$dry_run" -eq 0 ]; then
    "$@"
  fi
}

ecr_login() {
  echo "+ aws ecr get-login-password --region $region | docker login --username AWS --password-stdin $1" >&2
  if [ "$dry_run" -eq 0 ]; then
    aws ecr get-login-password --region "$region" | docker login --username AWS --password-stdin "$1"
  fi
}

if [ -z "$repo" ]; then
  repo="sagemaker-dist"
  [ "$pytorch" = 0 ] || repo="sagemaker-dist-pytorch"
fi
[[ "$pytorch_version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "PyTorch version '$pytorch_version' is not X.Y.Z"
if [ -z "$tag" ]; then
  tag="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$root/sagemaker_dist/__init__.py")"
  [ -n "$tag" ] || die "could not read __version__ from sagemaker_dist/__init__.py; pass --tag"
fi
if [ -z "$region" ] && [ "$dry_run" -eq 0 ]; then
  region="$(aws configure get region || true)"
fi
[ -n "$region" ] || die "no AWS region: pass --region (or set AWS_REGION)"
[[ "$region" =~ ^[a-z]{2}(-[a-z]+)+-[0-9]$ ]] || die "region '$region' is not an AWS region name"
if [ -z "$account" ]; then
  [ "$dry_run" -eq 0 ] || die "--dry-run needs --account"
  account="$(aws sts get-caller-identity --query Account --output text)"
fi
[[ "$account" =~ ^[0-9]{12}$ ]] || die "account '$account' is not a 12-digit AWS account id"
[[ "$repo" =~ ^[a-z0-9]+([._/-][a-z0-9]+)*$ ]] || die "repository '$repo' is not a valid ECR name"
[[ "$tag" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "tag '$tag' is not a valid image tag"
command -v docker >/dev/null || [ "$dry_run" -eq 1 ] || die "docker is not installed"
command -v aws >/dev/null || [ "$dry_run" -eq 1 ] || die "the AWS CLI (aws) is not installed"

domain="amazonaws.com"
case "$region" in cn-*) domain="amazonaws.com.cn" ;; esac
registry="$account.dkr.ecr.$region.$domain"
image="$registry/$repo:$tag"

if [ "$dry_run" -eq 1 ] || ! aws ecr describe-repositories --region "$region" \
  --repository-names "$repo" >/dev/null 2>&1; then
  run aws ecr create-repository --region "$region" --repository-name "$repo" \
    --image-scanning-configuration scanOnPush=true >&2
fi
ecr_login "$dlc_account.dkr.ecr.$region.$domain"
ecr_login "$registry"
framework_args=(--build-arg "TF_VERSION=$tf_version")
if [ "$pytorch" = 1 ]; then
  base="$dlc_account.dkr.ecr.$region.$domain/pytorch-training:$pytorch_version-gpu-py312-cu129-ubuntu22.04-sagemaker"
  framework_args=(--build-arg FRAMEWORK=torch --build-arg WITH_HOROVOD=0 --build-arg "BASE_IMAGE=$base")
fi
run docker build --platform linux/amd64 -f "$here/Dockerfile" --build-arg "REGION=$region" \
  "${framework_args[@]}" -t "$repo:$tag" "$root"
run docker tag "$repo:$tag" "$image"
run docker push "$image"
echo "$image"
