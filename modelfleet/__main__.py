from modelfleet.cli import main

main()
