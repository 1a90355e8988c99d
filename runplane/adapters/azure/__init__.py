"""Azure adapters: Table storage, Storage Queues, Blob storage. Built from injected service clients."""
