"""The laptop side: plan shards and channels, render and validate the request, create the job."""
