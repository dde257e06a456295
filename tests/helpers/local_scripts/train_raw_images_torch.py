"""Test entry script for a local torchrun job over raw objects (one JPEG per S3 object, the channel's
RecordWrapperType RecordIO): ``RecordBatches`` hands out the objects' bytes, ``decode_jpeg_batch`` decodes
them; each rank prints how many images it decoded and their shape.
"""

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from sagemaker_dist.runtime import PipeTraining, RecordBatches, ddp_main, decode_jpeg_batch, setup_ddp


@ddp_main
def main():
    job = setup_ddp()
    model = DDP(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = RecordBatches(job, 8)  # the channel's RecordWrapperType is RecordIO: one object a record
    training = PipeTraining(job, model, optimizer, epochs=1, join=True)
    seen = 0
    for _ in training.epochs():
        for batch in training.batches(batches):
            images = decode_jpeg_batch(batch, device=job.device, size=(16, 16))
            loss = model(images.float() / 255).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += len(images)
        training.end_epoch(images=seen)
    print(f"rank {job.rank}: decoded {seen} images of shape {tuple(images.shape[1:])}", flush=True)
    job.close()


main()
