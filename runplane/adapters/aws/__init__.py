"""AWS adapters: DynamoDB, SQS, S3. Built from an injected boto3 session or clients."""
