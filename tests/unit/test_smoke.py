from gpuctk.cdi.node.profile import available_profiles, load_profile


def test_profiles_load() -> None:
    names = available_profiles()
    assert {"h100-8", "a100-mig", "l4", "h100-8-mig7"} <= set(names)
    m = load_profile("a100-mig")
    assert [g.mig_enabled for g in m.gpus] == [False, True, True, True]
    assert m.gpus[3].mig_devices[0].profile == "1c.3g.20gb"
