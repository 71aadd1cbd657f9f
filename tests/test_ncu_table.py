"""tools/device/ncu_table.py: Nsight Compute's details page (as the H200 printed it, session 20, trimmed to the lines
the table reads and a few it must not mistake for them) into one markdown row a launch."""

from tools.device.ncu_table import main, merged, parse, table

PAGE = """\
==PROF== Connected to process 919
  _oneshot_down_kernel (1, 256, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    DRAM Throughput                   %        17.61
    Duration                         us         5.63
    One or More Eligible                   %        46.60
    No Eligible                            %        53.40
    Executed Instructions                           inst    1,794,304
    Avg. Executed Instructions Per Scheduler        inst     3,398.30
    Registers Per Thread             register/thread              78
    Waves Per SM                                                0.65
    Achieved Occupancy                        %        22.23
  _add_norm_route_kernel (128, 1, 1)x(32, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    DRAM Throughput                   %         1.83
    Duration                         ns       6430.00
    One or More Eligible                   %        14.74
    Executed Instructions                           inst      112,837
    Registers Per Thread             register/thread             179
    Achieved Occupancy                        %         1.67
  _oneshot_down_kernel (1, 256, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Duration                         us         5.83
    Executed Instructions                           inst    1,794,304
"""


def test_each_launch_with_its_metrics():
    launches = parse(PAGE)
    assert [(l["name"], l["grid"], l["threads"]) for l in launches] == [
        ("_oneshot_down_kernel", 256, 256), ("_add_norm_route_kernel", 128, 32), ("_oneshot_down_kernel", 256, 256)]
    first, route = launches[0], launches[1]
    assert first == {"name": "_oneshot_down_kernel", "grid": 256, "threads": 256, "dram": 17.61, "duration": 5.63,
                     "issue": 46.6, "instructions": 1794304.0, "regs": 78.0, "waves": 0.65, "occupancy": 22.23}
    assert route["duration"] == 6.43 and "waves" not in route  # ns to us; what the page lacks stays absent


def test_merged_rows_take_medians_in_first_launch_order():
    rows = merged(parse(PAGE))
    assert [(r["name"], r["launches"]) for r in rows] == [("_oneshot_down_kernel", 2), ("_add_norm_route_kernel", 1)]
    assert rows[0]["duration"] == 5.73 and rows[0]["regs"] == 78.0
    text = table(rows)
    assert "| _oneshot_down_kernel (2 launches) | 256 x 256 | 78 | 5.73 us | 1,794,304 | 47 % | 22.2 % | 17.6 % | 0.65 |" \
        in text
    assert "| _add_norm_route_kernel | 128 x 32 | 179 | 6.43 us | 112,837 | 15 % | 1.7 % | 1.8 % | - |" in text


def test_a_page_without_launches_says_so(tmp_path, capsys):
    page = tmp_path / "empty.log"
    page.write_text("==PROF== Disconnected\n")
    assert main([str(page)]) == 1
    assert "no kernel launches" in capsys.readouterr().err
