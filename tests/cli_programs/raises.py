"""An uncaught exception, chained to another one, raised a few calls down."""


def parse(text):
    return int(text)


def load(text):
    try:
        return parse(text)
    except ValueError as e:
        raise RuntimeError(f"cannot load {text!r}") from e


print("before")
load("x")
print("never")
