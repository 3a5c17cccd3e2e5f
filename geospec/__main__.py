from geospec.cli import main

main()
