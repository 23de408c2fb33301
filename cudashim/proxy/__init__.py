"""The proxy ``torch.cuda`` package: its classification table, implementation and modules."""
