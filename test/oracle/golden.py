"""Writes golden tensors in the format test/golden.hpp reads:
one tensor per line, "name d0 d1 ... : v0 v1 ...", values as hex floats."""


def write_golden(path, tensors, header=""):
    """tensors: dict name -> torch tensor (float64) or list of floats."""
    with open(path, "w") as f:
        for line in header.splitlines():
            f.write("# " + line + "\n")
        for name, t in tensors.items():
            shape = list(t.shape)
            values = t.detach().reshape(-1).tolist()
            f.write(name + " " + " ".join(str(d) for d in shape) + " : " +
                    " ".join(float(v).hex() for v in values) + "\n")


def read_golden(path):
    """The inverse: dict name -> (shape, list of floats)."""
    out = {}
    with open(path) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            head, values = line.split(" : ")
            parts = head.split()
            out[parts[0]] = ([int(d) for d in parts[1:]], [float.fromhex(v) for v in values.split()])
    return out
