"""TF-style variable names of torch modules' parameters and buffers: module
`net` and state-dict key `0.weight` are the variable `net/0/weight`.

A torch key cannot hold a '.' (it separates submodules), where a TF name
may (`linear_model/sepal.length/weights`): such a name's '.' is held in the
key as `DOT` and given back as '.' in the variable's name."""

DOT = "\u2024"   # ONE DOT LEADER, in a torch key, for a '.' of the TF name


def var_name(module: str, key: str) -> str:
    """The variable name of `module`'s state-dict entry `key`."""
    return module + "/" + key.replace(".", "/").replace(DOT, ".")


def torch_key(name: str) -> str:
    """`name`, a part of a TF variable name, as a torch parameter or buffer key."""
    return name.replace(".", DOT)
