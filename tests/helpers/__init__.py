"""Test helpers: S3 data on the moto server, fault-injecting proxies, /opt/ml trees, scripts ranks run."""
