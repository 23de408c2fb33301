"""How a patch is declared and applied: the vocabulary the patch groups (``cudashim.patches``) write in.

- ``rewriter.Rewrite``: a device argument translated on the way in;
- ``by_caller.ByCaller``: an answer that depends on who asks (``activation.callers``);
- ``refusal.Refusal``: an API the target cannot serve, harmless (a warning, a no-op) or refused;
- ``when_imported.WhenImported``: a patch made when its module is imported, while still active.

Each applies through ``activation.registry``, so deactivation undoes it, and each reaches the
report itself, so a group never checks whether the report is on.
"""
