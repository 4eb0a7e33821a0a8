"""Link flags for a library that Debian ships as both `libX.so` and `libX.a`."""

def system_linkopts(libs, extra = []):
    """Returns linkopts for `libs`: shared by default, a static group under --config=portable.

    Args:
      libs: library names without the `lib` prefix, in link order.
      extra: further flags (system libraries such as -lpthread) appended in both modes.
    """
    return select({
        "@attnmeta//third_party:static_link": ["-Wl,--start-group"] + ["-l:lib%s.a" % l for l in libs] + ["-Wl,--end-group"] + extra,
        "//conditions:default": ["-l%s" % l for l in libs] + extra,
    })
