"""DeepSpeed's C++ ops on this machine: whether loading them compiles
anything (dsops, read from files only) and the build locks in torch's JIT
extension cache that a killed build leaves behind (oplocks).
"""
