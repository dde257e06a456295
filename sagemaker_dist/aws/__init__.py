"""The AWS schema every side of sagemaker-dist uses: SageMaker instance types (``instances``), S3 objects
and the one S3 client policy (``s3_objects``, ``progress``), the CreateTrainingJob request's rules
(``request_validation``) and the tuning job's (``tuning``, ``tuning_ranges``, ``tuning_validation``).
The laptop (``launch``), each host (``host``) and the other platforms (``platforms``) import it; it
imports only ``contract`` and ``errors``."""
