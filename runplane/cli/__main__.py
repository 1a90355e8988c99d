from runplane.cli.main import main

main()
