"""Running graphs: for real on gloo ranks (``gloo``), inside ``torch.compile`` (``compile``), and
many problems as one sweep (``sweep``). Uses the models and the bridge; nothing imports it back."""
