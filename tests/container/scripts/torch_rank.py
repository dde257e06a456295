"""A torchrun rank of a job in the image: it reads its channel to the end, or raises where told
(``--fail_rank R``) once the process group is up."""

import argparse

from sagemaker_dist.runtime import PipeBatches, ddp_main, setup_ddp


@ddp_main
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail_rank", type=int, default=-1)
    args, _ = parser.parse_known_args()
    job = setup_ddp()
    if job.rank == args.fail_rank:
        raise ValueError(f"boom at rank {job.rank}")
    for _ in PipeBatches(job, 8):
        pass
    job.close()


main()
