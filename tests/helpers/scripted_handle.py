"""A training job handle that plays back DescribeTrainingJob answers."""

from __future__ import annotations

from sagemaker_dist.launch.training_job import TrainingJobHandle


class ScriptedHandle(TrainingJobHandle):
    """A handle whose DescribeTrainingJob answers follow a script: moto marks every job Completed at once,
    so the in-between statuses and a failure can only be played back."""

    def __init__(self, answers):
        super().__init__(training_job=None)
        self.answers = list(answers)

    @property
    def name(self):
        return "scripted"

    def describe(self):
        self.last = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return self.last

    def log_stream_names(self):  # the instance's stream appears once it trains
        return ["scripted/algo-1-1"] if self.last["SecondaryStatus"] != "Starting" else []
