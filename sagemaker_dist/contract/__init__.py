"""The SageMaker container contract, written once: stdlib only, imported by every other part."""
